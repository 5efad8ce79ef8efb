//! Verified execution (SSHSIG, envelopes).
