"""Training: the epoch loop, fit, schedules, self-critical training, rewards, distributed runs, resume."""
