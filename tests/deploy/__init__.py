"""Deployment: replicas behind a real nginx, the Kubernetes manifests, the image's files."""
