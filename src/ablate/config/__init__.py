"""The config, before anything is built: composing it, checking it (one line per mistake), its `_target_`s."""
