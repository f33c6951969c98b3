"""The kubelet's side: its gRPC APIs as generated stubs (`deviceplugin`, `podresources`, `pluginregistration`,
`dra`; protos/generate.py writes them) and the names of the workers' sockets in its plugin directory
(`plugin_socket`). May import the vocabulary."""

MAY_IMPORT = ("shared",)
