
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/common.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/common.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/common.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/error.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/error.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/error.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/implicit.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/implicit.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/implicit.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_datetime.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_datetime.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_datetime.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_enum.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_enum.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_enum.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_func.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_func.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_func.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_internals.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_internals.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_internals.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_ndarray.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_ndarray.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_ndarray.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_static_property.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_static_property.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_static_property.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/nb_type.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_type.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/nb_type.cpp.o.d"
  "/work/main/.venv/lib/python3.11/site-packages/nanobind/src/trampoline.cpp" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/trampoline.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/nanobind-static.dir/__/__/__/.venv/lib/python3.11/site-packages/nanobind/src/trampoline.cpp.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
