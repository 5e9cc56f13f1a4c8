"""Configuration, errors and the runtime (threads, devices, seeding): what every layer uses."""
