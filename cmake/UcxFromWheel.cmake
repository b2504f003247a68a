# UCX from PyPI's libucx wheel (libucx-cu13, libucx-cu12), for machines
# without a system UCX: a pip install, or a folder holding the wheel's
# libucx/ tree (GRADCOMM_UCX_ROOT, as scripts/prepare-gpu-deps lays it out).
# On success defines the imported target PkgConfig::UCX (the name the
# pkg-config path gives) and sets GRADCOMM_UCX_FROM to where it came from.
function(gradcomm_ucx_from_wheel)
  set(root "${GRADCOMM_UCX_ROOT}")
  if(NOT root)
    set(py "${Python3_EXECUTABLE}")
    if(NOT py AND Python_EXECUTABLE)
      set(py "${Python_EXECUTABLE}")
    endif()
    if(NOT py)
      find_program(py NAMES python3 python)
    endif()
    if(NOT py)
      return()
    endif()
    # Plain first (pip's isolated build environment holds the wheel as a
    # build requirement), then isolated mode (the environment pip runs in).
    foreach(mode "-c" "-Ic")
      execute_process(COMMAND "${py}" ${mode} "import libucx, os; print(os.path.dirname(libucx.__file__))"
                      OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
      if(rc EQUAL 0 AND EXISTS "${dir}/include/ucp/api/ucp.h")
        set(root "${dir}")
        break()
      endif()
    endforeach()
  endif()
  if(NOT root OR NOT EXISTS "${root}/include/ucp/api/ucp.h")
    return()
  endif()
  set(libs)
  foreach(name ucp uct ucs)
    find_library(GRADCOMM_UCX_LIB_${name} NAMES lib${name}.so.0 ${name} PATHS "${root}/lib" NO_DEFAULT_PATH NO_CACHE)
    if(NOT GRADCOMM_UCX_LIB_${name})
      return()
    endif()
    list(APPEND libs "${GRADCOMM_UCX_LIB_${name}}")
  endforeach()
  # A wheel found through Python may sit in pip's isolated build environment
  # (/tmp/pip-build-env-<random>/...), a new folder at every `pip install`:
  # its headers are compiled from a copy in the build tree instead, so the
  # compile commands stay the same from one install to the next and ccache
  # finds its earlier objects (with the temporary folder in every -I, each
  # install compiled the whole library again).
  set(include "${root}/include")
  if(NOT GRADCOMM_UCX_ROOT)
    set(include "${PROJECT_BINARY_DIR}/ucx-wheel/include")
    file(REMOVE_RECURSE "${include}")
    file(COPY "${root}/include/" DESTINATION "${include}")
  endif()
  add_library(PkgConfig::UCX INTERFACE IMPORTED GLOBAL)
  set_target_properties(PkgConfig::UCX PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${include}"
                                                  INTERFACE_LINK_LIBRARIES "${libs}")
  set(GRADCOMM_UCX_FROM "${root}" PARENT_SCOPE)
endfunction()
