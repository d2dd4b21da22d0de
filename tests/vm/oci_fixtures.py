"""OCI images made on the spot for the template tests: no registry, no network.

Well-formed images are made with umoci (init, new, unpack, repack, config) and copied to other
formats with skopeo; hostile ones are assembled by hand (blobs, config, manifest, index), since
no well-behaved tool writes a layer that climbs out of its root.
"""
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import threading


def run(*argv, cwd=None):
    subprocess.run(argv, check=True, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def busybox_image(layout, tag="latest", env=(), workdir=None, extra_files=None):
    """A busybox-only image: /bin/busybox and an applet link per command, nothing else (no bash,
    no python, no /tmp, /dev or /proc). extra_files: {path in the image: bytes}."""
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:{tag}")
    bundle = layout + ".bundle"
    run("umoci", "unpack", "--image", f"{layout}:{tag}", bundle)
    rootfs = os.path.join(bundle, "rootfs")
    os.makedirs(os.path.join(rootfs, "bin"))
    shutil.copy("/bin/busybox", os.path.join(rootfs, "bin", "busybox"))
    applets = subprocess.run(["/bin/busybox", "--list"], check=True, capture_output=True, text=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            os.symlink("busybox", os.path.join(rootfs, "bin", applet))
    for path, data in (extra_files or {}).items():
        full = os.path.join(rootfs, path.lstrip("/"))
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    run("umoci", "repack", "--image", f"{layout}:{tag}", bundle)
    config = []
    for entry in env:
        config += ["--config.env", entry]
    if workdir:
        config += ["--config.workingdir", workdir]
    if config:
        run("umoci", "config", "--image", f"{layout}:{tag}", *config)
    shutil.rmtree(bundle)


def add_layer_removing(layout, tag, path):
    """Adds a layer to the image that deletes `path` (umoci writes it as a whiteout)."""
    bundle = layout + ".bundle"
    run("umoci", "unpack", "--image", f"{layout}:{tag}", bundle)
    os.remove(os.path.join(bundle, "rootfs", path.lstrip("/")))
    run("umoci", "repack", "--image", f"{layout}:{tag}", bundle)
    shutil.rmtree(bundle)


def copy_image(source, dest):
    run("skopeo", "copy", "--quiet", source, dest)


def tar_layer(entries):
    """An uncompressed layer from entries: dicts with name, and type (file, dir, symlink, char),
    data, mode, link, major/minor."""
    types = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "char": tarfile.CHRTYPE}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry["name"])
            info.type = types[entry.get("type", "file")]
            info.mode = entry.get("mode", 0o644)
            info.linkname = entry.get("link", "")
            info.devmajor = entry.get("major", 0)
            info.devminor = entry.get("minor", 0)
            data = entry.get("data", b"")
            info.size = len(data) if info.type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if info.type == tarfile.REGTYPE else None)
    return buffer.getvalue()


def busybox_layer():
    """A layer of /bin/busybox and its applet links: enough for `sh -c` in a hand-made image."""
    with open("/bin/busybox", "rb") as f:
        entries = [{"name": "bin", "type": "dir", "mode": 0o755},
                   {"name": "bin/busybox", "data": f.read(), "mode": 0o755}]
    applets = subprocess.run(["/bin/busybox", "--list"], check=True, capture_output=True, text=True).stdout.split()
    entries += [{"name": "bin/" + a, "type": "symlink", "link": "busybox"} for a in applets if a != "busybox"]
    return tar_layer(entries)


def hand_made_image(layout, layers, architecture="amd64", config=None):
    """An OCI layout with the given layers, tagged latest: each uncompressed tar bytes, or a
    GzipLayer."""
    blobs = os.path.join(layout, "blobs", "sha256")
    os.makedirs(blobs)

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return {"digest": "sha256:" + digest, "size": len(data)}

    layer_descriptors = []
    diff_ids = []
    for layer in layers:
        if isinstance(layer, GzipLayer):
            layer_descriptors.append(dict(blob(layer.data), mediaType="application/vnd.oci.image.layer.v1.tar+gzip"))
            diff_ids.append(layer.diff_id)
        else:
            layer_descriptors.append(dict(blob(layer), mediaType="application/vnd.oci.image.layer.v1.tar"))
            diff_ids.append(layer_descriptors[-1]["digest"])
    image_config = {"architecture": architecture, "os": "linux", "config": config or {},
                    "rootfs": {"type": "layers", "diff_ids": diff_ids}}
    config_descriptor = dict(blob(json.dumps(image_config).encode()),
                             mediaType="application/vnd.oci.image.config.v1+json")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": config_descriptor, "layers": layer_descriptors}
    manifest_descriptor = dict(blob(json.dumps(manifest).encode()),
                               mediaType="application/vnd.oci.image.manifest.v1+json",
                               annotations={"org.opencontainers.image.ref.name": "latest"})
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [manifest_descriptor]}, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion": "1.0.0"}')


class GzipLayer:
    def __init__(self, data, diff_id):
        self.data = data
        self.diff_id = diff_id


def dense_file_layer(work, size_mib):
    """A gzip layer holding one file of size_mib MiB of zeros, written out in the tar (not
    sparse): tiny compressed, its full size once unpacked."""
    tree = os.path.join(work, "dense-tree")
    os.makedirs(tree)
    with open(os.path.join(tree, "big"), "wb") as f:
        f.truncate(size_mib << 20)
    tar = subprocess.Popen(["tar", "-cf", "-", "-C", tree, "big"], stdout=subprocess.PIPE)
    gzip = subprocess.Popen(["gzip", "-1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    digest = hashlib.sha256()
    chunks = []
    reader = threading.Thread(target=lambda: chunks.append(gzip.stdout.read()))
    reader.start()
    while block := tar.stdout.read(1 << 20):
        digest.update(block)
        gzip.stdin.write(block)
    gzip.stdin.close()
    reader.join()
    if tar.wait() != 0 or gzip.wait() != 0:
        raise RuntimeError("tar | gzip failed")
    return GzipLayer(chunks[0], "sha256:" + digest.hexdigest())


def sparse_file_layer(work, size_gib):
    """A layer holding one sparse file of size_gib GiB (GNU tar's sparse format: a few KiB)."""
    tree = os.path.join(work, "sparse-tree")
    os.makedirs(tree)
    with open(os.path.join(tree, "huge"), "wb") as f:
        f.truncate(size_gib << 30)
    tar = os.path.join(work, "sparse.tar")
    run("tar", "--sparse", "-cf", tar, "-C", tree, "huge")
    with open(tar, "rb") as f:
        return f.read()
