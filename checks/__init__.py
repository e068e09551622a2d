"""Active health checks: a catalogue of light and intrusive checks, their parsers, job-respecting
scheduling on Slurm and Kubernetes, and the results as Prometheus gauges, node labels and comments."""
