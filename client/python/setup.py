"""Build hook of the ringattn Python client: generates the gRPC stubs.

The package's metadata lives in pyproject.toml; this file only adds one step to
`build_py`: running grpcio-tools' protoc over ringattn/v1/*.proto, so that
`ringattn.v1.attention_pb2` and friends are produced from the repository's own
API definitions at build time and never checked in.

Where the .proto files are found, first match wins:
  1. $RINGATTN_PROTO_DIR (a directory holding ringattn/v1/*.proto);
  2. <this dir>/proto (what an sdist built by this file carries);
  3. <this dir>/../../proto (the repository layout: client/python -> proto).

The stubs are written into the build directory (and so into the wheel); an
editable install (`pip install -e`) writes them into src/ringattn/v1/ instead
(git-ignored). grpcio-tools is a build requirement (pyproject.toml), so
`pip install ./client/python` needs nothing installed beforehand.
"""

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))


def _proto_root():
    candidates = [
        os.environ.get("RINGATTN_PROTO_DIR"),
        os.path.join(HERE, "proto"),
        os.path.join(HERE, "..", "..", "proto"),
    ]
    for candidate in candidates:
        if candidate and glob.glob(
                os.path.join(candidate, "ringattn", "v1", "*.proto")):
            return os.path.normpath(candidate)
    raise RuntimeError(
        "ringattn: cannot find ringattn/v1/*.proto; looked in "
        + ", ".join(c for c in candidates if c)
        + " (set RINGATTN_PROTO_DIR to the repository's proto/ directory)")


def _generate_stubs(out_dir):
    """Runs protoc on every ringattn/v1/*.proto, writing under out_dir."""
    import grpc_tools
    from grpc_tools import protoc

    root = _proto_root()
    protos = sorted(glob.glob(os.path.join(root, "ringattn", "v1", "*.proto")))
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    os.makedirs(out_dir, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        "--proto_path=" + root,
        "--proto_path=" + well_known,
        "--python_out=" + out_dir,
        "--pyi_out=" + out_dir,
        "--grpc_python_out=" + out_dir,
    ] + protos
    if protoc.main(args) != 0:
        raise RuntimeError("ringattn: protoc failed on " + " ".join(protos))


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            _generate_stubs(os.path.join(HERE, "src"))
        else:
            _generate_stubs(self.build_lib)


class SdistWithProtos(sdist):
    """Carries the .proto files inside the sdist (as proto/), so it builds alone."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        source = os.path.join(_proto_root(), "ringattn")
        target = os.path.join(base_dir, "proto", "ringattn")
        if os.path.exists(target):
            shutil.rmtree(target)
        shutil.copytree(source, target,
                        ignore=lambda d, names: [
                            n for n in names
                            if not n.endswith(".proto")
                            and not os.path.isdir(os.path.join(d, n))
                        ])


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos})
