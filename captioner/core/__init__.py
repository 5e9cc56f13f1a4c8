"""Configuration, errors and the process settings (threads, devices, seeding): what every layer uses."""
