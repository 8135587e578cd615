# timewheel: one image for every process (api, scheduler, dev).
#   docker build -t timewheel .
#   docker run -p 8080:8080 -v timewheel-data:/data timewheel    # `timewheel dev --no-postgres`
# Production runs Redis and PostgreSQL as their own services: see deploy/docker-compose.yml.
FROM python:3.11-slim-bookworm

# redis-server is here only for `timewheel dev` (Redis, API and scheduler in one container;
# the image has no PostgreSQL server, so dev runs without the archive).
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY timewheel ./timewheel
COPY lua ./lua
COPY deploy ./deploy
RUN pip install . && rm -rf /src

RUN useradd --system --uid 10001 --create-home --home-dir /home/timewheel timewheel \
    && mkdir /data \
    && chown timewheel:timewheel /data
USER timewheel
WORKDIR /home/timewheel
VOLUME /data

EXPOSE 8080
CMD ["timewheel", "dev", "--host", "0.0.0.0", "--data-dir", "/data", "--no-postgres"]
