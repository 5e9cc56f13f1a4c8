"""One module per `captioner` command: its arguments (`add_parser`) and what it does (`run`)."""
