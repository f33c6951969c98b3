"""Container Device Interface specs: read and checked as the reference library reads them (`spec`), the spec
dirs read as runtimes read them (`spec_dirs`), the transient specs a previous instance left removed
(`stale_specs`), and the CDI annotation of an Allocate answer (`annotation`). May import the vocabulary and
`fs`."""

MAY_IMPORT = ("shared", "shared.fs")
