"""Signal sources. One boundary module per external system; each returns frozen samples and turns
its system's errors into values, so one failing source never stops the loop."""
