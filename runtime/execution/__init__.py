"""Running the user's code: loading the target, the Function that parses, calls and
serialises, offloading sync code to threads or killable processes, finite checks, and
the hand-off of places (user-code threads here, request slots in serving)."""
