"""Small file-system helpers: files replaced whole (the one atomic writer), files and directories opened
without following links or trusting strangers, and the one door to inotify. Imports nothing of the project."""

MAY_IMPORT: tuple[str, ...] = ()
