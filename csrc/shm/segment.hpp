// A POSIX shared-memory segment mapped into this process.
//
// The group's first rank creates it (O_EXCL: a name is never reused by accident), every rank maps
// it, and once all have mapped it every rank unlinks the name: from then on the memory lives only
// as long as the mappings, so a SIGKILLed job leaves nothing in /dev/shm.
#pragma once

#include <cstddef>
#include <string>

namespace commlayer::shm {

class Mapping {
public:
    // create=true: a new segment of `bytes` (fails if the name exists); else open an existing one.
    Mapping(const std::string& name, std::size_t bytes, bool create);
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;

    char* data() const { return data_; }
    std::size_t bytes() const { return bytes_; }
    // Write zeros over [offset, offset+bytes) so its pages are placed near the calling rank.
    void touch(std::size_t offset, std::size_t bytes);

private:
    char* data_ = nullptr;
    std::size_t bytes_ = 0;
};

// Remove the name; true if this call removed it, false if it was already gone.
bool unlink_segment(const std::string& name);

}  // namespace commlayer::shm
