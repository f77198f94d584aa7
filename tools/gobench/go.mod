module lab/tools/gobench

go 1.26.0

require (
	golang.org/x/crypto v0.31.0
	golang.org/x/sys v0.49.0
)
