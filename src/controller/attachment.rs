//! Pure helpers of the attach/detach handler (work in progress).
