# One image for the server and the workers (CPU; for NCCL nodes start from a
# CUDA base image and install the CUDA build of torch).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY api api
COPY worker worker
COPY db db
COPY cli cli
COPY ddpo ddpo
# With s3fs, tensorboard and MLflow's client: the store and the tracking settings work as they are.
RUN pip install --no-cache-dir '.[s3,tensorboard,mlflow]'
WORKDIR /var/lib/ddpo
