// Where a template's root filesystem comes from, and the tools that bring it in:
//   oci-archive:PATH, docker-archive:PATH, oci:DIR[:TAG]  an image, copied into an OCI layout
//                                                         of ours by skopeo, unpacked by umoci;
//   dir:PATH                                              a directory tree, copied as it is;
//   a Containerfile                                       built by buildah (--isolation chroot)
//                                                         into an OCI layout, then as an image;
//   packages:a,b,c                                        Debian 12 (minbase, python3, procps)
//                                                         with those packages, by debootstrap.
// Images are untrusted: skopeo checks every blob's digest, umoci keeps every path of every
// layer inside the target (whiteouts applied), and the config is read with its types checked.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace agentvm {

enum class SourceKind { oci_archive, docker_archive, oci_layout, dir, containerfile, packages };

struct TemplateSource {
    SourceKind kind = SourceKind::dir;
    std::filesystem::path path;        // the archive, layout, directory or Containerfile
    std::string tag;                   // oci: the tag in the layout ("" for its only image)
    std::filesystem::path context;     // containerfile: the build context
    std::vector<std::string> packages; // packages: what to add to the default guest's
    std::string mirror;                // packages: the Debian mirror (not part of the key)
    std::string text() const;          // as the user would write it
};

// Parses --from. Throws Error naming what is wrong (unknown transport, missing path).
TemplateSource parse_from(const std::string& from);
TemplateSource containerfile_source(const std::filesystem::path& file, const std::filesystem::path& context);
// --packages a,b,c: Debian package names, checked; from `mirror`.
TemplateSource packages_source(const std::string& list, const std::string& mirror);

// What an image's config sets for the processes it runs.
struct ImageConfig {
    std::string architecture;
    std::vector<std::string> env;   // KEY=VALUE
    std::string workdir;
    std::string user;
};

// Parses an OCI image config (skopeo inspect --config). Throws Error for a config that is not
// an object or has fields of the wrong type.
ImageConfig parse_image_config(const std::string& json);

// The tools each kind of source needs, as (tool, Debian package).
std::vector<std::pair<std::string, std::string>> tools_for(const TemplateSource& source);

// Brings an image source into the OCI layout `layout` under the tag "image" (skopeo copy; for
// a Containerfile, buildah build then push). Throws Error.
void import_image(const TemplateSource& source, const std::filesystem::path& layout, const std::string& name);
// The config of the image in `layout`.
ImageConfig read_image_config(const std::filesystem::path& layout);
// The manifest digest of the image in `layout`: what the image is, content-addressed.
std::string image_digest(const std::filesystem::path& layout);
// debootstraps a packages source into `tree` (which must not exist), its downloads cached in
// `debs`. Throws Error with the end of debootstrap's log.
void debootstrap_tree(const TemplateSource& source, const std::filesystem::path& tree, const std::filesystem::path& debs);
// Unpacks the image's layers into the existing directory `target` (umoci raw unpack).
void unpack_image(const std::filesystem::path& layout, const std::filesystem::path& target);

} // namespace agentvm
