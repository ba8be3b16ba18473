
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/src/qkv/_native/binding.cpp" "src/qkv/_native/CMakeFiles/_ext.dir/binding.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/_ext.dir/binding.cpp.o.d"
  "/work/main/src/qkv/_native/dispatch.cpp" "src/qkv/_native/CMakeFiles/_ext.dir/dispatch.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/_ext.dir/dispatch.cpp.o.d"
  "/work/main/src/qkv/_native/kernels_avx2.cpp" "src/qkv/_native/CMakeFiles/_ext.dir/kernels_avx2.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/_ext.dir/kernels_avx2.cpp.o.d"
  "/work/main/src/qkv/_native/kernels_avx512.cpp" "src/qkv/_native/CMakeFiles/_ext.dir/kernels_avx512.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/_ext.dir/kernels_avx512.cpp.o.d"
  "/work/main/src/qkv/_native/kernels_portable.cpp" "src/qkv/_native/CMakeFiles/_ext.dir/kernels_portable.cpp.o" "gcc" "src/qkv/_native/CMakeFiles/_ext.dir/kernels_portable.cpp.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build-dev/src/qkv/_native/CMakeFiles/nanobind-static.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
