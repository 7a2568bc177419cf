# The labels-party service (FastAPI + uvicorn); with EXTRAS=labels,spark (as docker-compose.yml builds it) also
# Spark, Java 17 from Debian, and the same image runs the Spark standalone master and workers, so the executors run
# exactly the driver's Python and labels_party. Settings come from the environment (deploy/labels.env.example).
#
# BASE_IMAGE: python:3.11-slim from a registry, or labeldp/python:3.11-bookworm built from Debian's packages by
# deploy/images/build.sh --bases local (no registry). Either provides `python` and `pip` on PATH.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ARG EXTRAS=labels
RUN case ",$EXTRAS," in *,spark,*) apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      --no-install-recommends openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/* ;; esac
WORKDIR /app
# Dependencies first, from pyproject.toml alone (empty packages and README stand in): a change to the code or the
# README rebuilds only the last layers.
COPY pyproject.toml ./
RUN mkdir -p shared labeldp labels_party \
 && touch README.md shared/__init__.py labeldp/__init__.py labels_party/__init__.py \
 && pip install --no-cache-dir --quiet ".[$EXTRAS]" \
 && pip uninstall --quiet --yes labeldp && rm -rf README.md shared labeldp labels_party build *.egg-info
COPY README.md ./
COPY shared ./shared
COPY labeldp ./labeldp
COPY labels_party ./labels_party
RUN pip install --no-cache-dir --quiet --no-deps . && rm -rf build *.egg-info
# One fixed uid: the replicas and the Spark workers share volumes (data, sources) and must own the same files.
RUN useradd --uid 10001 --create-home labeldp && mkdir -p /data /keys /spark-keys /audit /sources \
 && chown labeldp /data /keys /spark-keys /audit /sources
USER labeldp
EXPOSE 8700
CMD ["labeldp", "labels", "serve", "--host", "0.0.0.0", "--port", "8700", "--upgrade-db"]
