"""Our programs against the incumbent flow (a .tflite compiled by Vela and run by TFLM), on the
same model file, the same Vela and the same target."""
