"""The global layer: one read API over every cluster's health service (docs/fleet.md).

Each cluster keeps its own stack and runs alone when cut off; this layer only reads. It asks every
cluster's health service at once, merges the answers under each cluster's name, and says which clusters
did not answer instead of answering as if they had no nodes. It never drains, resumes or overrides:
those stay with each cluster's own health service.
"""
