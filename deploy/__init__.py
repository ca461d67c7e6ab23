"""Deployment: the container's entry point (deploy/entrypoint.py); Dockerfile, Kubernetes manifests (k8s/) and Ray
Serve application configs (ray/) beside it."""
