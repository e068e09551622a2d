"""The anomaly service: finds the straggler node of a running job from GPU telemetry and says why."""
