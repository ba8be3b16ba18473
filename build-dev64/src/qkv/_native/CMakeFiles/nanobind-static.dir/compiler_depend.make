# Empty compiler generated dependencies file for nanobind-static.
# This may be replaced when dependencies are built.
