"""Input, DummyData and the data-source layers (Data, ImageData, WindowData, HDF5Data, HDF5Output, MemoryData)."""
