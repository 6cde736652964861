//! Meta commands: mg ms md ma mn me.
