# The labels-party service (FastAPI + uvicorn). Database and data directory come from the environment:
# LABELDP_DATABASE_URL, LABELDP_DATA_DIR and the policy settings (see deploy/labels.env.example); the schema is
# migrated on start (--upgrade-db).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY labeldp ./labeldp
COPY labels_party ./labels_party
# this party's code and dependencies only (pyproject's extra 'labels'); source datasets released by Spark need
# EXTRAS=labels,spark, which also installs Debian's Java 17 runtime (`docker compose build --build-arg
# EXTRAS=labels,spark labels`)
ARG EXTRAS=labels
RUN case ",$EXTRAS," in *,spark,*) apt-get update && apt-get install -y --no-install-recommends \
      openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/* ;; esac
RUN pip install --no-cache-dir ".[$EXTRAS]"
RUN useradd --create-home labeldp && mkdir -p /data && chown labeldp /data
USER labeldp
EXPOSE 8700
CMD ["labeldp", "labels", "serve", "--host", "0.0.0.0", "--port", "8700", "--upgrade-db"]
