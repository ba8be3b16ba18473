file(REMOVE_RECURSE
  "CMakeFiles/_ext.dir/binding.cpp.o"
  "CMakeFiles/_ext.dir/binding.cpp.o.d"
  "CMakeFiles/_ext.dir/dispatch.cpp.o"
  "CMakeFiles/_ext.dir/dispatch.cpp.o.d"
  "CMakeFiles/_ext.dir/kernels_avx2.cpp.o"
  "CMakeFiles/_ext.dir/kernels_avx2.cpp.o.d"
  "CMakeFiles/_ext.dir/kernels_avx512.cpp.o"
  "CMakeFiles/_ext.dir/kernels_avx512.cpp.o.d"
  "CMakeFiles/_ext.dir/kernels_portable.cpp.o"
  "CMakeFiles/_ext.dir/kernels_portable.cpp.o.d"
  "_ext.cpython-311-x86_64-linux-gnu.so"
  "_ext.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/_ext.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
