# What libmqtt_inbox.so exports (docs/c-api.md#symbols), one rule for the version script
# (cmake/export_map.cmake) and for the ctest that checks the built library
# (tests/capi/check_exported_symbols.cmake).
#
# mqtt_inbox_is_api_symbol(<nm type> <mangled name> <demangled name> <out var>)
function(mqtt_inbox_is_api_symbol type name dname out)
  set(${out} FALSE PARENT_SCOPE)
  # The C API: its functions.
  if(name MATCHES "^mqtt_inbox_[A-Za-z0-9_]+$")
    if(type STREQUAL "T")
      set(${out} TRUE PARENT_SCOPE)
    endif()
    return()
  endif()
  # The C++ API: defined, not a weak function (W: every caller has its own copy), in
  # namespace mqtt_inbox itself: its functions and members (_ZN/_ZNK), or the type
  # information, vtable, VTT (_ZT[ISVT]), thunks (_ZTh, _ZTv) or guard variables (_ZGVZ) of
  # its classes. Not a template of another namespace whose return type names ours.
  if(NOT type MATCHES "^[TDBRVu]$")
    return()
  endif()
  if(NOT name MATCHES "^_Z(NK?|T[ISVT]N|Th[n]?[0-9]+_N|Tv[n]?[0-9]+_n?[0-9]+_N|GVZN)10mqtt_inbox")
    return()
  endif()
  # Not the library's internals, a class's private implementation, an anonymous namespace
  # or a Paho type in the signature.
  if(dname MATCHES "mqtt_inbox::(detail|capi)::|::Impl(::|\\(|$| |\\*|&|>|,)|\\(anonymous namespace\\)|(^|[^a-z_:])mqtt::")
    return()
  endif()
  set(${out} TRUE PARENT_SCOPE)
endfunction()
