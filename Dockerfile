# syntax=docker/dockerfile:1
# The specroute proxy. Build: docker build -t specroute .
# Configure with a TOML file (`serve --config /etc/specroute/specroute.toml`, mounted) or with
# SPECROUTE_* variables (SPECROUTE_BACKENDS=http://a:30000,http://b:30000, SPECROUTE_POLICY, ...).

FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir build==1.2.2
COPY pyproject.toml README.md ./
COPY specroute ./specroute
RUN python -m build --wheel --outdir /dist

FROM python:3.11-slim AS runtime
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin specroute
COPY --from=build /dist/*.whl /tmp/wheels/
RUN pip install --no-cache-dir /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER 10001
WORKDIR /home/specroute
# 0.0.0.0 inside the container, so that a published port reaches it: set SPECROUTE_API_KEYS (or
# api_keys in the config) before publishing beyond this machine; without keys the proxy warns at
# start that anyone who reaches it can use it.
ENV PYTHONUNBUFFERED=1 \
    SPECROUTE_HOST=0.0.0.0 \
    SPECROUTE_PORT=8000
EXPOSE 8000
# /health answers from the proxy itself (never a backend generation); stdlib only, no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('SPECROUTE_PORT', '8000') + '/health', timeout=2)"]
ENTRYPOINT ["specroute"]
CMD ["serve"]
