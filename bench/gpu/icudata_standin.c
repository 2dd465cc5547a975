/* A stand-in for ICU's data library (libicudata, 30 MB) in the GPU machine bundle
 * (bench/gpu/pack_device.sh). Helios asks ICU only for character properties and root-locale case
 * maps, which libicuuc carries built in, so the data is never read. Should ICU look for it, this
 * header's zero magic makes it report U_INVALID_FORMAT_ERROR, an error the caller sees, not a
 * crash. ICU_DATA_SYMBOL is the entry point libicuuc names, e.g. icudt72_dat. */
#ifndef ICU_DATA_SYMBOL
#error "compile with -DICU_DATA_SYMBOL=icudtNN_dat (objdump -T libicuuc.so.NN | grep icudt)"
#endif
__attribute__((aligned(16), visibility("default"))) const unsigned char ICU_DATA_SYMBOL[64] = {0};
