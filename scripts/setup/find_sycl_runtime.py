"""Print the SYCL include directory and libsycl path of the intel-sycl-rt wheel installed in
this interpreter's environment, as a CMake list. Used by CMakeLists.txt."""
import importlib.metadata
import sys


def main() -> int:
    try:
        dist = importlib.metadata.distribution("intel-sycl-rt")
    except importlib.metadata.PackageNotFoundError:
        return 1
    include_dir = library = None
    for f in dist.files or ():
        path = str(f).replace("\\", "/")
        if path.endswith("include/sycl/sycl.hpp"):
            include_dir = dist.locate_file(f).resolve().parent.parent
        elif path.endswith("/libsycl.so"):
            library = dist.locate_file(f).resolve()
    if include_dir is None or library is None:
        return 1
    print(f"{include_dir};{library}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
