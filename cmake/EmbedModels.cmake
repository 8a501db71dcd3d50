# Writes OUT: a C++ file holding the model library's YAML files (FILES, paths
# under IN_DIR separated by |) as raw strings, so the library travels inside
# the binary.
# Run as: cmake -DIN_DIR=... "-DFILES=a.yaml|b.yaml" -DOUT=... -P EmbedModels.cmake
string(REPLACE "|" ";" FILES "${FILES}")
set(files "")
foreach(f ${FILES})
  file(RELATIVE_PATH rel "${IN_DIR}" "${f}")
  list(APPEND files "${rel}")
endforeach()
list(SORT files)
set(body "")
foreach(f ${files})
  file(READ "${IN_DIR}/${f}" text)
  string(FIND "${text}" ")cnnflow_yaml\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${f} contains the raw-string delimiter )cnnflow_yaml\"")
  endif()
  string(APPEND body "      {\"models/${f}\", R\"cnnflow_yaml(${text})cnnflow_yaml\"},\n")
endforeach()
file(WRITE "${OUT}.tmp" "// Generated from models/*.yaml by cmake/EmbedModels.cmake: do not edit.\n#include \"pipeline/model_library_data.h\"\n\nnamespace cnnflow {\n\nconst std::vector<std::pair<std::string, std::string>>& ModelLibraryFiles() {\n  static const std::vector<std::pair<std::string, std::string>> files = {\n${body}  };\n  return files;\n}\n\n}  // namespace cnnflow\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
