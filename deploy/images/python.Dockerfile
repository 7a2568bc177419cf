# A Python 3.11 base from Debian's packages only (deploy/images/build.sh --bases local): the same contract the party
# images rely on in python:3.11-slim — `python` and `pip` on PATH, installing into a writable prefix — with Debian's
# python3 in a virtual environment at /opt/venv.
ARG DEBIAN_IMAGE=labeldp/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --quiet --upgrade pip
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
CMD ["python3"]
