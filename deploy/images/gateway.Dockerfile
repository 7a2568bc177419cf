# The labels party's front door: HAProxy (Debian's package) spreading requests over the labels-service replicas,
# each checked on /readyz and looked up again through Docker's DNS (a restarted replica may get a new address).
ARG DEBIAN_IMAGE=debian:bookworm-slim
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/*
COPY gateway.cfg /etc/haproxy/labeldp.cfg
USER haproxy
EXPOSE 8700
CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/labeldp.cfg"]
