# The features-party trainer service (FastAPI + JAX). For a GPU host install ".[features,gpu]".
# Settings from the environment: LABELDP_TRAINER_* (see deploy/features.env.example); the schema is migrated on
# start (--upgrade-db).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY labeldp ./labeldp
COPY features_party ./features_party
# this party's code and dependencies only (pyproject's extra 'features')
RUN pip install --no-cache-dir ".[features]"
RUN useradd --create-home labeldp && mkdir -p /data && chown labeldp /data
USER labeldp
EXPOSE 8701
CMD ["labeldp", "features", "serve", "--host", "0.0.0.0", "--port", "8701", "--upgrade-db"]
