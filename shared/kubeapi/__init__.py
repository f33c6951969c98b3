"""The API server's side: its objects in its protobuf encoding (`resource.v1`: the ResourceSlice messages
protos/generate.py writes; `protobuf`: their conversion to and from the JSON objects the rest of the project
handles). Imports nothing of the project."""

MAY_IMPORT: tuple[str, ...] = ()
