# The server's own image. It talks to the host's Docker engine through the
# socket mounted at run time (never baked in, never passed on to a sandbox).
#   deploy/build-base-image python && docker build -t sandbox-mcp .
# and the README's "In Docker" gives the docker run (tests/e2e/test_server_image.py
# runs it as written). The base is the locally built sandbox-mcp/python:3, so the
# build needs no registry but PyPI; --build-arg BASE=IMAGE names any other Debian 12
# image with python3 (3.11) and venv, e.g. python:3.11-slim-bookworm.
ARG BASE=sandbox-mcp/python:3

# Build stage: uv resolves the locked dependencies into /opt/sandbox-mcp. The
# dependencies are their own layer, so a code change does not download them again.
FROM ${BASE} AS build
# Compiled to bytecode here: the image runs with PYTHONDONTWRITEBYTECODE, and without
# .pyc files every start compiled ~1,000 modules again (1.2 s of CPU, issue 13).
ENV UV_PROJECT_ENVIRONMENT=/opt/sandbox-mcp UV_LINK_MODE=copy UV_COMPILE_BYTECODE=1
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN /opt/uv/bin/uv sync --frozen --no-dev --no-install-project --no-editable
COPY app ./app
COPY auth ./auth
COPY pool ./pool
COPY jail ./jail
RUN /opt/uv/bin/uv sync --frozen --no-dev --no-editable

# The image: the same base, the environment, no uv, no sources, no build caches.
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/sandbox-mcp/bin:$PATH \
    SANDBOX_MCP_STATE_DIR=/state \
    SANDBOX_MCP_HOST=0.0.0.0 \
    SANDBOX_MCP_PORT=8000
COPY --from=build /opt/sandbox-mcp /opt/sandbox-mcp

# A non-root user; it reaches the engine through the socket's group at run time
# (docker run --group-add $(stat -c %g /var/run/docker.sock) ...). Sandbox commands
# run as another uid, 10002, which owns nothing of the server's (the database, the
# token key, the state dir are 10001's, 0700). So that the server can still hand
# workspaces to 10002 and read, write and delete what sandboxes leave there, its
# Python binary carries the file capabilities cap_chown, cap_dac_override and
# cap_fowner (xattr security.capability, v2, effective): the server has them, and
# only it, inside its own container. They are in Docker's default capability set:
# do not --cap-drop them, nor run the server with no-new-privileges (it then keeps
# none and warns that sandboxes cannot write). Set with os.setxattr: no libcap.
RUN groupadd --system --gid 10001 sandbox-mcp \
    && useradd --system --uid 10001 --gid 10001 --home-dir /state \
       --shell /usr/sbin/nologin sandbox-mcp \
    && mkdir -p /state && chown sandbox-mcp /state && chmod 0700 /state \
    && python3 -c "import os, struct; os.setxattr(os.path.realpath('/opt/sandbox-mcp/bin/python3'), 'security.capability', struct.pack('<5I', 0x02000001, 0b1011, 0, 0, 0))"
ENV SANDBOX_MCP_SANDBOX_USER=10002:10002
USER sandbox-mcp
VOLUME /state
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import sys,urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status == 200 else 1)"]

ENTRYPOINT ["sandbox-mcp"]
CMD ["serve"]
