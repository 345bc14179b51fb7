"""The device agent: model store, resumable transfers, hot swaps, and the MQTT loop."""
