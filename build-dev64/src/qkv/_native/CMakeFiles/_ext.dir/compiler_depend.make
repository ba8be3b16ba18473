# Empty compiler generated dependencies file for _ext.
# This may be replaced when dependencies are built.
