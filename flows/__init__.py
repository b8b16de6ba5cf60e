"""Prefect 3 flows and deployments of the hargo pipeline (``flows.pipeline``; deployments in
``prefect.yaml``; docs/prefect.md explains running them)."""
