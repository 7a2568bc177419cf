# PostgreSQL 15 from Debian's packages (deploy/images/build.sh --bases local), keeping the part of the official
# postgres image's contract docker-compose.yml relies on: POSTGRES_USER, POSTGRES_PASSWORD (or
# POSTGRES_PASSWORD_FILE) and POSTGRES_DB create the cluster on an empty volume at /var/lib/postgresql/data, the
# *.sql files in /docker-entrypoint-initdb.d run once then, `pg_isready` answers only once the real server runs,
# and the server runs in the foreground as the unprivileged postgres user.
ARG DEBIAN_IMAGE=labeldp/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /docker-entrypoint-initdb.d /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 0700 /var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
CMD ["postgres"]
