# The features-party trainer service (FastAPI + JAX). For a GPU host install ".[features,gpu]". Settings come from
# the environment: LABELDP_TRAINER_* (see deploy/features.env.example).
#
# BASE_IMAGE: python:3.11-slim from a registry, or labeldp/python:3.11-bookworm built from Debian's packages by
# deploy/images/build.sh --bases local (no registry).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
# EXTRAS: the pip extras installed; docker-compose.yml sets "features,spark", deploy/compose.gpu.yml
# "features,spark,gpu" (JAX with CUDA 12 from PyPI's wheels: that build needs a package index, unlike the rest of an
# air-gapped build).
ARG EXTRAS=features
# Spark's Java runtime, for the trainer's Spark jobs ("engine": "spark") and its cluster's daemons (the spark extra)
RUN case ",$EXTRAS," in *,spark,*) apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
      --no-install-recommends openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/* ;; esac
WORKDIR /app
# Dependencies first, from pyproject.toml alone (empty packages and README stand in): a change to the code or the
# README rebuilds only the last layers.
COPY pyproject.toml ./
RUN mkdir -p shared labeldp features_party \
 && touch README.md shared/__init__.py labeldp/__init__.py features_party/__init__.py \
 && pip install --no-cache-dir --quiet ".[${EXTRAS}]" \
 && pip uninstall --quiet --yes labeldp && rm -rf README.md shared labeldp features_party build *.egg-info
COPY README.md ./
COPY shared ./shared
COPY labeldp ./labeldp
COPY features_party ./features_party
RUN pip install --no-cache-dir --quiet --no-deps . && rm -rf build *.egg-info
RUN useradd --uid 10002 --create-home labeldp && mkdir -p /data /keys /spark-keys && chown labeldp /data /keys /spark-keys
USER labeldp
EXPOSE 8701
CMD ["labeldp", "features", "serve", "--host", "0.0.0.0", "--port", "8701", "--upgrade-db"]
