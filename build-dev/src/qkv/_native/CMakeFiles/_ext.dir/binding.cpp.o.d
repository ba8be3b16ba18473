src/qkv/_native/CMakeFiles/_ext.dir/binding.cpp.o: \
 /work/main/src/qkv/_native/binding.cpp /usr/include/stdc-predef.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nanobind.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_python.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/Python.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/patchlevel.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pyconfig.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pymacconfig.h \
 /usr/include/c++/12/stdlib.h /usr/include/c++/12/cstdlib \
 /usr/include/x86_64-linux-gnu/c++/12/bits/c++config.h \
 /usr/include/x86_64-linux-gnu/c++/12/bits/os_defines.h \
 /usr/include/features.h /usr/include/features-time64.h \
 /usr/include/x86_64-linux-gnu/bits/wordsize.h \
 /usr/include/x86_64-linux-gnu/bits/timesize.h \
 /usr/include/x86_64-linux-gnu/sys/cdefs.h \
 /usr/include/x86_64-linux-gnu/bits/long-double.h \
 /usr/include/x86_64-linux-gnu/gnu/stubs.h \
 /usr/include/x86_64-linux-gnu/gnu/stubs-64.h \
 /usr/include/x86_64-linux-gnu/c++/12/bits/cpu_defines.h \
 /usr/include/c++/12/pstl/pstl_config.h /usr/include/stdlib.h \
 /usr/include/x86_64-linux-gnu/bits/libc-header-start.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stddef.h \
 /usr/include/x86_64-linux-gnu/bits/waitflags.h \
 /usr/include/x86_64-linux-gnu/bits/waitstatus.h \
 /usr/include/x86_64-linux-gnu/bits/floatn.h \
 /usr/include/x86_64-linux-gnu/bits/floatn-common.h \
 /usr/include/x86_64-linux-gnu/bits/types/locale_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/__locale_t.h \
 /usr/include/x86_64-linux-gnu/sys/types.h \
 /usr/include/x86_64-linux-gnu/bits/types.h \
 /usr/include/x86_64-linux-gnu/bits/typesizes.h \
 /usr/include/x86_64-linux-gnu/bits/time64.h \
 /usr/include/x86_64-linux-gnu/bits/types/clock_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/clockid_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/time_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/timer_t.h \
 /usr/include/x86_64-linux-gnu/bits/stdint-intn.h /usr/include/endian.h \
 /usr/include/x86_64-linux-gnu/bits/endian.h \
 /usr/include/x86_64-linux-gnu/bits/endianness.h \
 /usr/include/x86_64-linux-gnu/bits/byteswap.h \
 /usr/include/x86_64-linux-gnu/bits/uintn-identity.h \
 /usr/include/x86_64-linux-gnu/sys/select.h \
 /usr/include/x86_64-linux-gnu/bits/select.h \
 /usr/include/x86_64-linux-gnu/bits/types/sigset_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/__sigset_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_timeval.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_timespec.h \
 /usr/include/x86_64-linux-gnu/bits/pthreadtypes.h \
 /usr/include/x86_64-linux-gnu/bits/thread-shared-types.h \
 /usr/include/x86_64-linux-gnu/bits/pthreadtypes-arch.h \
 /usr/include/x86_64-linux-gnu/bits/atomic_wide_counter.h \
 /usr/include/x86_64-linux-gnu/bits/struct_mutex.h \
 /usr/include/x86_64-linux-gnu/bits/struct_rwlock.h /usr/include/alloca.h \
 /usr/include/x86_64-linux-gnu/bits/stdlib-bsearch.h \
 /usr/include/x86_64-linux-gnu/bits/stdlib-float.h \
 /usr/include/c++/12/bits/std_abs.h /usr/include/stdio.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stdarg.h \
 /usr/include/x86_64-linux-gnu/bits/types/__fpos_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/__mbstate_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/__fpos64_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/__FILE.h \
 /usr/include/x86_64-linux-gnu/bits/types/FILE.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_FILE.h \
 /usr/include/x86_64-linux-gnu/bits/types/cookie_io_functions_t.h \
 /usr/include/x86_64-linux-gnu/bits/stdio_lim.h \
 /usr/include/x86_64-linux-gnu/bits/stdio.h /usr/include/errno.h \
 /usr/include/x86_64-linux-gnu/bits/errno.h /usr/include/linux/errno.h \
 /usr/include/x86_64-linux-gnu/asm/errno.h \
 /usr/include/asm-generic/errno.h /usr/include/asm-generic/errno-base.h \
 /usr/include/x86_64-linux-gnu/bits/types/error_t.h /usr/include/string.h \
 /usr/include/strings.h /usr/include/unistd.h \
 /usr/include/x86_64-linux-gnu/bits/posix_opt.h \
 /usr/include/x86_64-linux-gnu/bits/environments.h \
 /usr/include/x86_64-linux-gnu/bits/confname.h \
 /usr/include/x86_64-linux-gnu/bits/getopt_posix.h \
 /usr/include/x86_64-linux-gnu/bits/getopt_core.h \
 /usr/include/x86_64-linux-gnu/bits/unistd_ext.h \
 /usr/include/linux/close_range.h /usr/include/assert.h \
 /usr/include/wchar.h /usr/include/x86_64-linux-gnu/bits/wchar.h \
 /usr/include/x86_64-linux-gnu/bits/types/wint_t.h \
 /usr/include/x86_64-linux-gnu/bits/types/mbstate_t.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pyport.h \
 /usr/include/inttypes.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/stdint.h /usr/include/stdint.h \
 /usr/include/x86_64-linux-gnu/bits/stdint-uintn.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/limits.h \
 /usr/lib/gcc/x86_64-linux-gnu/12/include/syslimits.h \
 /usr/include/limits.h /usr/include/x86_64-linux-gnu/bits/posix1_lim.h \
 /usr/include/x86_64-linux-gnu/bits/local_lim.h \
 /usr/include/linux/limits.h \
 /usr/include/x86_64-linux-gnu/bits/pthread_stack_min-dynamic.h \
 /usr/include/x86_64-linux-gnu/bits/posix2_lim.h \
 /usr/include/x86_64-linux-gnu/bits/xopen_lim.h \
 /usr/include/x86_64-linux-gnu/bits/uio_lim.h /usr/include/c++/12/math.h \
 /usr/include/c++/12/cmath /usr/include/c++/12/bits/cpp_type_traits.h \
 /usr/include/c++/12/ext/type_traits.h /usr/include/math.h \
 /usr/include/x86_64-linux-gnu/bits/math-vector.h \
 /usr/include/x86_64-linux-gnu/bits/libm-simd-decl-stubs.h \
 /usr/include/x86_64-linux-gnu/bits/flt-eval-method.h \
 /usr/include/x86_64-linux-gnu/bits/fp-logb.h \
 /usr/include/x86_64-linux-gnu/bits/fp-fast.h \
 /usr/include/x86_64-linux-gnu/bits/mathcalls-helper-functions.h \
 /usr/include/x86_64-linux-gnu/bits/mathcalls.h \
 /usr/include/x86_64-linux-gnu/bits/mathcalls-narrow.h \
 /usr/include/x86_64-linux-gnu/bits/iscanonical.h \
 /usr/include/c++/12/bits/specfun.h \
 /usr/include/c++/12/bits/stl_algobase.h \
 /usr/include/c++/12/bits/functexcept.h \
 /usr/include/c++/12/bits/exception_defines.h \
 /usr/include/c++/12/ext/numeric_traits.h \
 /usr/include/c++/12/bits/stl_pair.h /usr/include/c++/12/type_traits \
 /usr/include/c++/12/bits/move.h /usr/include/c++/12/bits/utility.h \
 /usr/include/c++/12/bits/stl_iterator_base_types.h \
 /usr/include/c++/12/bits/stl_iterator_base_funcs.h \
 /usr/include/c++/12/bits/concept_check.h \
 /usr/include/c++/12/debug/assertions.h \
 /usr/include/c++/12/bits/stl_iterator.h \
 /usr/include/c++/12/bits/ptr_traits.h /usr/include/c++/12/debug/debug.h \
 /usr/include/c++/12/bits/predefined_ops.h /usr/include/c++/12/limits \
 /usr/include/c++/12/tr1/gamma.tcc \
 /usr/include/c++/12/tr1/special_function_util.h \
 /usr/include/c++/12/tr1/bessel_function.tcc \
 /usr/include/c++/12/tr1/beta_function.tcc \
 /usr/include/c++/12/tr1/ell_integral.tcc \
 /usr/include/c++/12/tr1/exp_integral.tcc \
 /usr/include/c++/12/tr1/hypergeometric.tcc \
 /usr/include/c++/12/tr1/legendre_function.tcc \
 /usr/include/c++/12/tr1/modified_bessel_func.tcc \
 /usr/include/c++/12/tr1/poly_hermite.tcc \
 /usr/include/c++/12/tr1/poly_laguerre.tcc \
 /usr/include/c++/12/tr1/riemann_zeta.tcc \
 /usr/include/x86_64-linux-gnu/sys/time.h /usr/include/time.h \
 /usr/include/x86_64-linux-gnu/bits/time.h \
 /usr/include/x86_64-linux-gnu/bits/timex.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_tm.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_itimerspec.h \
 /usr/include/x86_64-linux-gnu/sys/stat.h \
 /usr/include/x86_64-linux-gnu/bits/stat.h \
 /usr/include/x86_64-linux-gnu/bits/struct_stat.h \
 /usr/include/x86_64-linux-gnu/bits/statx.h /usr/include/linux/stat.h \
 /usr/include/linux/types.h /usr/include/x86_64-linux-gnu/asm/types.h \
 /usr/include/asm-generic/types.h /usr/include/asm-generic/int-ll64.h \
 /usr/include/x86_64-linux-gnu/asm/bitsperlong.h \
 /usr/include/asm-generic/bitsperlong.h /usr/include/linux/posix_types.h \
 /usr/include/linux/stddef.h \
 /usr/include/x86_64-linux-gnu/asm/posix_types.h \
 /usr/include/x86_64-linux-gnu/asm/posix_types_64.h \
 /usr/include/asm-generic/posix_types.h \
 /usr/include/x86_64-linux-gnu/bits/statx-generic.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_statx_timestamp.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_statx.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/exports.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pymacro.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pymath.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pymem.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pymem.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pytypedefs.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pybuffer.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/object.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/object.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/objimpl.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/objimpl.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/typeslots.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pyhash.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pydebug.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/bytearrayobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/bytearrayobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/bytesobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/bytesobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/unicodeobject.h \
 /usr/include/ctype.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/unicodeobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/longobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/longobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/longintrepr.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/boolobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/floatobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/floatobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/complexobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/complexobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/rangeobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/memoryobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/tupleobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/tupleobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/listobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/listobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/dictobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/dictobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/odictobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/enumobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/setobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/setobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/methodobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/methodobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/moduleobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/funcobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/classobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/fileobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/fileobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pycapsule.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/code.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pyframe.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pyframe.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/traceback.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/traceback.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/sliceobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/cellobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/iterobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/initconfig.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pystate.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pystate.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/genobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/descrobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/descrobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/genericaliasobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/warnings.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/warnings.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/weakrefobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/weakrefobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/structseq.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/picklebufobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pytime.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/codecs.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pyerrors.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pyerrors.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pythread.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pythread.h \
 /usr/include/pthread.h /usr/include/sched.h \
 /usr/include/x86_64-linux-gnu/bits/sched.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct_sched_param.h \
 /usr/include/x86_64-linux-gnu/bits/cpu-set.h \
 /usr/include/x86_64-linux-gnu/bits/setjmp.h \
 /usr/include/x86_64-linux-gnu/bits/types/struct___jmp_buf_tag.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/context.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/modsupport.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/modsupport.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/compile.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/compile.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pythonrun.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pythonrun.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pylifecycle.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pylifecycle.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/ceval.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/ceval.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/sysmodule.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/sysmodule.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/osmodule.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/intrcheck.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/import.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/import.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/abstract.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/abstract.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/bltinmodule.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pyctype.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pystrtod.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pystrcmp.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/fileutils.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/fileutils.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/pyfpe.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/tracemalloc.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/frameobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/cpython/frameobject.h \
 /root/.pyenv/versions/3.11.7/include/python3.11/pythread.h \
 /usr/include/c++/12/cstddef /usr/include/c++/12/cstdint \
 /usr/include/c++/12/cstring /usr/include/c++/12/exception \
 /usr/include/c++/12/bits/exception.h \
 /usr/include/c++/12/bits/exception_ptr.h \
 /usr/include/c++/12/bits/cxxabi_init_exception.h \
 /usr/include/c++/12/typeinfo /usr/include/c++/12/bits/hash_bytes.h \
 /usr/include/c++/12/new /usr/include/c++/12/bits/nested_exception.h \
 /usr/include/c++/12/stdexcept /usr/include/c++/12/string \
 /usr/include/c++/12/bits/stringfwd.h \
 /usr/include/c++/12/bits/memoryfwd.h \
 /usr/include/c++/12/bits/char_traits.h \
 /usr/include/c++/12/bits/postypes.h /usr/include/c++/12/cwchar \
 /usr/include/c++/12/bits/allocator.h \
 /usr/include/x86_64-linux-gnu/c++/12/bits/c++allocator.h \
 /usr/include/c++/12/bits/new_allocator.h \
 /usr/include/c++/12/bits/localefwd.h \
 /usr/include/x86_64-linux-gnu/c++/12/bits/c++locale.h \
 /usr/include/c++/12/clocale /usr/include/locale.h \
 /usr/include/x86_64-linux-gnu/bits/locale.h /usr/include/c++/12/iosfwd \
 /usr/include/c++/12/cctype /usr/include/c++/12/bits/ostream_insert.h \
 /usr/include/c++/12/bits/cxxabi_forced.h \
 /usr/include/c++/12/bits/stl_function.h \
 /usr/include/c++/12/backward/binders.h \
 /usr/include/c++/12/bits/refwrap.h /usr/include/c++/12/bits/invoke.h \
 /usr/include/c++/12/bits/range_access.h \
 /usr/include/c++/12/initializer_list \
 /usr/include/c++/12/bits/basic_string.h \
 /usr/include/c++/12/ext/alloc_traits.h \
 /usr/include/c++/12/bits/alloc_traits.h \
 /usr/include/c++/12/bits/stl_construct.h /usr/include/c++/12/string_view \
 /usr/include/c++/12/bits/functional_hash.h \
 /usr/include/c++/12/bits/string_view.tcc \
 /usr/include/c++/12/ext/string_conversions.h /usr/include/c++/12/cstdio \
 /usr/include/c++/12/cerrno /usr/include/c++/12/bits/charconv.h \
 /usr/include/c++/12/bits/basic_string.tcc /usr/include/c++/12/utility \
 /usr/include/c++/12/bits/stl_relops.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_defs.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_platform.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_traits.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_tuple.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_backend.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_backend_slots.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_descr.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_types.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_accessor.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_error.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_attr.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_cast.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_misc.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_call.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_func.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/nb_class.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/ndarray.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/stl/string.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/stl/tuple.h \
 /usr/include/c++/12/tuple /usr/include/c++/12/bits/uses_allocator.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/stl/vector.h \
 /work/main/.venv/lib/python3.11/site-packages/nanobind/include/nanobind/stl/detail/nb_list.h \
 /usr/include/c++/12/vector /usr/include/c++/12/bits/stl_uninitialized.h \
 /usr/include/c++/12/bits/stl_vector.h \
 /usr/include/c++/12/bits/stl_bvector.h \
 /usr/include/c++/12/bits/vector.tcc \
 /work/main/src/qkv/_native/dispatch.hpp \
 /work/main/src/qkv/_native/params.hpp \
 /work/main/src/qkv/_native/philox.hpp
