"""Deploying a function: Ray Serve (serve --ray), Kubernetes manifests, images."""
