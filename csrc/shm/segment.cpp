#include "segment.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace commlayer::shm {

namespace {

std::runtime_error os_error(const std::string& what, const std::string& name) {
    return std::runtime_error("shm: " + what + " '" + name + "' failed: " + std::strerror(errno));
}

}  // namespace

Mapping::Mapping(const std::string& name, std::size_t bytes, bool create) : bytes_(bytes) {
    const int flags = create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR;
    const int fd = ::shm_open(name.c_str(), flags, 0600);
    if (fd < 0) throw os_error(create ? "creating segment" : "opening segment", name);
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
        const std::runtime_error error = os_error("sizing segment", name);
        ::close(fd);
        ::shm_unlink(name.c_str());
        throw error;
    }
    struct stat info {};
    if (!create && (::fstat(fd, &info) != 0 || static_cast<std::size_t>(info.st_size) < bytes)) {
        ::close(fd);
        throw std::runtime_error("shm: segment '" + name + "' is smaller than the " + std::to_string(bytes) +
                                 " bytes this rank expects (ranks disagree on the layout)");
    }
    void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);  // the mapping keeps the memory
    if (address == MAP_FAILED) throw os_error("mapping segment", name);
    data_ = static_cast<char*>(address);
}

Mapping::~Mapping() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
}

void Mapping::touch(std::size_t offset, std::size_t bytes) {
    if (offset + bytes > bytes_) throw std::out_of_range("shm: touch outside the segment");
    std::memset(data_ + offset, 0, bytes);
}

bool unlink_segment(const std::string& name) {
    if (::shm_unlink(name.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    throw os_error("unlinking segment", name);
}

}  // namespace commlayer::shm
