# The host's own certificate authorities (Debian's /usr/local/share/ca-certificates: a site's TLS-inspecting proxy
# or its internal package mirror) added to a Python base, so pip inside the build trusts what the host trusts.
# Certificates are public; nothing secret enters the image. deploy/images/build.sh adds this layer only when the
# host has such certificates.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
COPY *.crt /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null
# pip in a virtual environment reads its own CA bundle (certifi), not the system's: point it at the system's.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
