"""The CLI's commands beyond `serve`: `check`, the `show`/`gids` tables, `demo`, `bundle`."""
