"""A lab of network namespaces, mount namespaces and cgroups on this machine."""
