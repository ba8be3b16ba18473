file(REMOVE_RECURSE
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/common.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/common.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/error.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/error.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/implicit.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/implicit.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_datetime.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_datetime.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_enum.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_enum.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_func.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_func.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_internals.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_internals.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_ndarray.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_ndarray.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_static_property.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_static_property.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_type.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_type.cpp.o.d"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/trampoline.cpp.o"
  "CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/trampoline.cpp.o.d"
  "libnanobind-static.a"
  "libnanobind-static.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/nanobind-static.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
