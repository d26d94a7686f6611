# The tailguard controller image (deploy/base/deployment.yaml runs it as `tailguard run --config ...`).
#   docker build -t tailguard:0.1.0 .
# Not built in CI: docker cannot run on the project's machines; tests/integration/test_packaging.py builds the
# first stage's wheel (offline, without dependencies) and checks it holds every module and data file under one
# top-level import package, `tailguard` (pyproject.toml maps the folders controller/, serving/, predictors/ onto it).
# The image runs as a non-root user (uid 10001,
# matching the Deployment's runAsUser) with a read-only root filesystem; it writes only to /var/lib/tailguard
# and /tmp, which the Deployment mounts as emptyDirs.

# promtool (a static Go binary) from the official Prometheus image, pinned: `tailguard rules validate` parses every
# rendered query with it, and refuses to pass without a parser (install promtool or --prometheus).
FROM prom/prometheus:v2.53.2 AS promtool

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY controller ./controller
COPY serving ./serving
COPY predictors ./predictors
# Wheels of the project and its runtime dependencies (the `cluster` extra: kubernetes and grafana-client;
# `ml`: the SLA models' scikit-learn and skops). No dev tools in the runtime image.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[cluster,ml]'

FROM python:3.11-slim
RUN groupadd --gid 10001 tailguard \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/tailguard --shell /usr/sbin/nologin tailguard \
    && install -d -o 10001 -g 10001 /var/lib/tailguard
COPY --from=promtool /bin/promtool /usr/local/bin/promtool
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels tailguard[cluster,ml] && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/tailguard
EXPOSE 9464
ENTRYPOINT ["tailguard"]
CMD ["run", "--config", "/etc/tailguard/config/controller.yaml"]
