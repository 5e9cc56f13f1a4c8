"""One module per `captioner` command (push beside export): its arguments (`add_parser`) and what it does (`run`)."""
