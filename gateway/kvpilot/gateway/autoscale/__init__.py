"""Queue-depth autoscaling: a pure policy, a loop that observes pools, and drivers that apply decisions."""
