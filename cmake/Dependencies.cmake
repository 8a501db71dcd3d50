# Every external library, found once (facts in ../shared/TOOLCHAIN.md).
find_package(TBB 2021 REQUIRED COMPONENTS tbb)
find_package(yaml-cpp REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)
find_package(dnnl REQUIRED)   # DNNL::dnnl; Debian's build uses GNU OpenMP
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
pkg_check_modules(TURBOJPEG REQUIRED IMPORTED_TARGET libturbojpeg)
pkg_check_modules(PNG REQUIRED IMPORTED_TARGET libpng)
find_package(MPI REQUIRED COMPONENTS CXX)   # MPI::MPI_CXX, MPIEXEC_EXECUTABLE
find_package(OpenCV REQUIRED COMPONENTS core imgproc)
pkg_check_modules(CAIRO REQUIRED IMPORTED_TARGET cairo)  # cnnflow plot, bench --plot: PNG and SVG
find_package(Protobuf REQUIRED)   # protobuf::libprotobuf, which ONNX's targets name
find_package(ONNX REQUIRED)       # onnx_proto: the ModelProto of cnnflow export

if(CNNFLOW_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

if(CNNFLOW_WITH_CUDA)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
endif()
